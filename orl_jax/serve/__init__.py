"""The server: the per-row engine behind an OpenAI-compatible HTTP API (docs/serving.md).

engine.py (the device side), scheduler.py (the thread that owns it), protocol.py (the API's
bodies), app.py (the FastAPI routes), metrics.py (Prometheus), load.py (a served model from a
run config and its weights), server.py (uvicorn, draining on SIGTERM)."""
