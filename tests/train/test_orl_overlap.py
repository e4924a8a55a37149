"""Verification overlapped with decoding (docs/training.md#verification-overlapped-with-decoding):
the rollout in chunks, each chunk verified on the host while the device decodes the next, gives
the serial loop's rollouts, rewards and updates bit for bit; the phase times and the device's
busy share are logged."""
import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from orl_jax.metrics import read_jsonl
from orl_jax.train import orl
from orl_jax.train.entry import train
from orl_jax.train.phases import DeviceTimeline, VerifyCalls, busy_seconds
from orl_jax.setup.build import build_setup
from orl_jax.train.run import prepare_run
from tests.support.helpers import orl_smoke_config

PHASE_KEYS = ("sec_rollout", "sec_verify_exposed", "sec_verify_host", "sec_plan", "sec_gather",
              "sec_update", "sec_checkpoint", "sec_iteration", "device_busy")
TIMES = PHASE_KEYS   # wall times (and their ratio) differ between runs; nothing else may


def _config(workdir, chunks: int, overlap: bool, steps: int = 3, by: str = "prompts"):
  c = orl_smoke_config(workdir, steps=steps)
  c.orl.prompts_per_step = 4          # 4 prompts x 4 responses: 2 chunks of 2 prompts (or of
  c.orl.group_size = 4                # 2 responses of every prompt)
  c.orl.rollout_chunks, c.orl.verify_while_decoding = chunks, overlap
  c.orl.chunk_by = by
  return c


def _run(workdir, chunks: int, overlap: bool, by: str = "prompts"):
  """(params, metrics rows) of a short ORL run."""
  out = train(_config(workdir, chunks, overlap, by=by), progress=False)
  return (load_file(os.path.join(out, "params.safetensors")),
          read_jsonl(os.path.join(workdir, "metrics.jsonl")))


def _same_run(a, b):
  (params_a, rows_a), (params_b, rows_b) = a, b
  assert params_a.keys() == params_b.keys()
  for k in params_a:
    np.testing.assert_array_equal(params_a[k], params_b[k], err_msg=k)
  strip = lambda r: {k: v for k, v in r.items() if k not in TIMES}
  assert [strip(r) for r in rows_a] == [strip(r) for r in rows_b]


@pytest.fixture(scope="module", params=["samples", "prompts"])
def chunked_runs(tmp_path_factory, request):
  root = tmp_path_factory.mktemp(f"overlap_{request.param}")
  runs: dict = {overlap: _run(root / f"overlap_{overlap}", 2, overlap, request.param)
                for overlap in (True, False)}
  runs["metrics"] = str(root / "overlap_True" / "metrics.jsonl")
  return runs


def test_overlapped_and_serial_chunked_runs_are_bit_identical(chunked_runs):
  _same_run(chunked_runs[True], chunked_runs[False])
  rows = chunked_runs[True][1]
  assert [r["updates"] for r in rows] == [1, 2, 3]     # every iteration applied an update
  assert all(r["states_packed"] > 0 and r["policy_lag"] == 0 for r in rows)


def test_the_metrics_line_holds_the_phase_times(chunked_runs):
  for overlap in (True, False):
    for row in chunked_runs[overlap][1]:
      assert set(PHASE_KEYS) <= row.keys()
      assert all(row[k] >= 0 for k in PHASE_KEYS)
      assert 0 < row["device_busy"] <= 1
      assert row["sec_update"] > 0 and row["sec_rollout"] > 0
      assert row["sec_iteration"] >= row["sec_rollout"] + row["sec_verify_exposed"]
  from orl_jax.apps.summary import phase_line, training_summary
  summary = training_summary(chunked_runs["metrics"])
  assert 0 < summary["device_busy_mean"] <= 1 and summary["sec_iteration_mean"] > 0
  assert phase_line(summary).startswith("phase times (mean seconds per iteration): rollout ")
  text = orl.progress_text(dict(reward=0.5, rollout_tpf=1.0, device_busy=0.75), {}, 0, 1)
  assert text.endswith(", idle=25%")


def test_samples_chunks_are_put_back_in_prompt_major_order(tmp_path):
  """chunk_by="samples": chunk c decodes every prompt with fold_in(key, c) and G/K responses
  each; the concatenation, the host summary and the rewards hold prompt p's responses at rows
  [p*G, (p+1)*G), chunk 0's first -- each reward that of the response on its row."""
  s = build_setup(_config(tmp_path / "samples", 2, True, by="samples"))
  r = prepare_run(s)
  steps = orl.build_orl_steps(s, r, orl.prompt_stream(s))
  prompts = orl.draw_prompts(steps, 0)
  clock = DeviceTimeline(steps.waiter)
  trajs, sums = orl.dispatch_rollouts(steps, r.state, prompts, clock)
  p, g = 4, 2                          # prompts, responses a prompt in a chunk
  for c, traj in enumerate(trajs):
    direct = steps.rollout(r.state.params, prompts.tokens, prompts.valid,
                           jax.random.fold_in(prompts.rollout_key, c), r.state.step)
    np.testing.assert_array_equal(np.asarray(traj.responses), np.asarray(direct.responses))
    assert traj.responses.shape[0] == p * g
  whole = steps.concat(*trajs)
  for c, traj in enumerate(trajs):
    for name in ("responses", "n_generated"):
      got = np.asarray(getattr(whole, name)).reshape((p, 2, g) + getattr(traj, name).shape[1:])
      np.testing.assert_array_equal(got[:, c], np.asarray(getattr(traj, name)).reshape(
          (p, g) + getattr(traj, name).shape[1:]), err_msg=name)
    np.testing.assert_array_equal(np.asarray(whole.capture.z).reshape(
        (p, 2, g) + traj.capture.z.shape[1:])[:, c], np.asarray(traj.capture.z).reshape(
            (p, g) + traj.capture.z.shape[1:]))
  np.testing.assert_array_equal(np.asarray(whole.prompt_valid), np.asarray(prompts.valid))

  class ByText:                        # a deterministic verifier: a reward per response text
    def score_batch(self, problems, responses):
      return [float(len(t) % 7) for t in responses]
  steps.verify_calls = VerifyCalls(ByText())
  summary, rewards, _ = orl._pull_and_verify(steps, trajs, sums, prompts, 0.0)
  np.testing.assert_array_equal(summary.responses, np.asarray(whole.responses))
  np.testing.assert_array_equal(summary.prompt_ids, np.asarray(prompts.ids))
  texts = [s.tokenizer.decode(row, stop_at_eos=True) for row in summary.responses]
  np.testing.assert_array_equal(rewards, [float(len(t) % 7) for t in texts])
  steps.close()
  r.ckpt.close()


def test_one_chunk_is_the_plain_rollout(tmp_path):
  """rollout_chunks=1: the loop's rollout is a direct call of the jitted rollout (the same key
  and program), and overlapping changes nothing; with 2 chunks, chunk c is the rollout of its
  prompts with fold_in(key, c)."""
  _same_run(_run(tmp_path / "a", 1, True), _run(tmp_path / "b", 1, False))
  for chunks in (1, 2):
    s = build_setup(_config(tmp_path / f"direct{chunks}", chunks, True))
    r = prepare_run(s)
    steps = orl.build_orl_steps(s, r, orl.prompt_stream(s))
    prompts = orl.draw_prompts(steps, 0)
    trajs, _ = orl.dispatch_rollouts(steps, r.state, prompts, DeviceTimeline(steps.waiter))
    n = s.config.orl.prompts_per_step // chunks
    for c, traj in enumerate(trajs):
      key = prompts.rollout_key if chunks == 1 else jax.random.fold_in(prompts.rollout_key, c)
      direct = steps.rollout(r.state.params, prompts.tokens[c * n:(c + 1) * n],
                             prompts.valid[c * n:(c + 1) * n], key, r.state.step)
      for x, y in zip(jax.tree.leaves(traj), jax.tree.leaves(direct)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    steps.close()
    r.ckpt.close()


@pytest.mark.parametrize("intervals, window, expected", [
    ([(1.0, 3.0), (2.0, 5.0)], (0.0, 10.0), 4.0),             # overlapping: [1, 5]
    ([(1.0, 2.0), (4.0, 6.0)], (0.0, 10.0), 3.0),             # disjoint
    ([(-2.0, 1.0), (9.0, 12.0), (3.0, 4.0)], (0.0, 10.0), 3.0),  # clipped to the window
    ([(1.0, 8.0), (2.0, 3.0)], (0.0, 10.0), 7.0),             # one inside another
    ([(11.0, 12.0)], (0.0, 10.0), 0.0),                       # outside
    ([], (0.0, 10.0), 0.0),                                   # empty
])
def test_busy_seconds_is_the_measure_of_the_union(intervals, window, expected):
  assert busy_seconds(intervals, *window) == pytest.approx(expected, abs=1e-12)
  assert busy_seconds(intervals[::-1], *window) == pytest.approx(expected, abs=1e-12)


CODE_PROBLEMS = [
    {"id": "add", "prompt": "def add(a, b):\n", "entry_point": "add",
     "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n"},
    {"id": "neg", "prompt": "def neg(a):\n", "entry_point": "neg",
     "tests": "def check(candidate):\n    assert candidate(2) == -2\n"},
    {"id": "dbl", "prompt": "def dbl(a):\n", "entry_point": "dbl",
     "tests": "def check(candidate):\n    assert candidate(2) == 4\n"},
    {"id": "one", "prompt": "def one():\n", "entry_point": "one",
     "tests": "def check(candidate):\n    assert candidate() == 1\n"},
]


def _code_task(tmp_path):
  path = tmp_path / "code.jsonl"
  path.write_text("".join(json.dumps(p) + "\n" for p in CODE_PROBLEMS))
  return str(path)


def test_the_code_verifier_is_submitted_without_a_pool(tmp_path):
  """The sandboxed code verifier (behind the chat-template mapping) starts its own jobs: the
  loop calls its `submit`, and a right and a wrong completion score 1 and 0."""
  from orl_jax.tasks import get_task
  from configs import tiny
  c = tiny.get_config("smoke")
  c.task.name, c.task.path = "jsonl", _code_task(tmp_path)
  task = get_task(c.task)
  calls = VerifyCalls(task.verifier.code)
  assert calls.own_submit and calls.pool is None
  problem = task.train_problem(0)
  scores, seconds = calls.submit([problem, problem], ["    return a + b\n",
                                                      "    return a - b\n"]).result()
  assert scores == [1.0, 0.0] and seconds > 0
  task.verifier.code.inner.close()


def test_the_overlapped_loop_trains_on_a_code_task(tmp_path):
  c = _config(tmp_path / "code", 2, True, steps=2, by="samples")
  c.task.name, c.task.path, c.task.prompt_len = "jsonl", _code_task(tmp_path), 32
  c.model.vocab_size = 260            # the byte-level debug tokenizer
  train(c, progress=False)
  rows = read_jsonl(str(tmp_path / "code" / "metrics.jsonl"))
  assert [r["updates"] for r in rows] == [1, 2]
  assert all(r["sec_verify_host"] > 0 and 0 < r["device_busy"] <= 1 for r in rows)


def test_chunks_that_do_not_divide_are_config_errors():
  from orl_jax.config.build import ConfigError, build
  from orl_jax.setup.resolve import check_divisible_by_shards
  c = _config("unused", 3, True)
  with pytest.raises(ConfigError, match=r"orl.rollout_chunks=3 .*orl.prompts_per_step=4"):
    build(c)
  c.orl.chunk_by = "samples"
  with pytest.raises(ConfigError, match=r"orl.rollout_chunks=3 .*orl.group_size=4"):
    build(c)
  c.orl.chunk_by = "rows"
  with pytest.raises(ConfigError, match=r"orl.chunk_by='rows' must be one of"):
    build(c)
  c.orl.chunk_by = "prompts"
  c.orl.rollout_chunks = 2            # 2 prompts per chunk do not split over 4 shards
  with pytest.raises(ConfigError, match=r"orl.prompts_per_step / orl.rollout_chunks=2 must be"):
    check_divisible_by_shards(build(c), 4)
  check_divisible_by_shards(build(c), 2)
  c.orl.rollout_segment_iterations = -1
  with pytest.raises(ConfigError, match=r"orl.rollout_segment_iterations=-1 must be >= 0"):
    build(c)


@pytest.mark.parametrize("by", ["samples", "prompts"])
def test_a_chunked_run_resumes_from_its_rollout_snapshot(tmp_path, by):
  """The snapshot holds the chunks concatenated, restored with the unchunked shapes: a run
  killed between rollout and update resumes from it bit-identically."""
  from tests.support.helpers import resumes_bit_exactly_after_a_crash

  def cfg(workdir):
    c = _config(workdir, 2, True, steps=2, by=by)
    c.checkpoint.every, c.checkpoint.save_rollouts = 1, True
    return c

  rows = resumes_bit_exactly_after_a_crash(cfg, tmp_path, 1)
  assert [(r["step"], r["rollout_from_snapshot"]) for r in rows] == [(1, 0.0), (2, 1.0)]


def test_per_row_responses_are_verified_as_their_rows_retire(tmp_path, monkeypatch):
  """The per-row rollout in segments (`orl.rollout_segment_iterations`), each response verified
  once a segment shows its row retired, trains exactly as the rollout in one program verified
  when it ends: 8 responses a chunk on 2 rows, so rows retire (and are refilled) segment after
  segment and the verifier gets several submissions a chunk."""
  submits = []
  real_submit = VerifyCalls.submit

  def counted(self, problems, responses):
    submits.append(len(responses))
    return real_submit(self, problems, responses)

  monkeypatch.setattr(VerifyCalls, "submit", counted)
  runs = {}
  for segments in (True, False):
    c = _config(tmp_path / f"segments_{segments}", 2, segments, steps=2, by="samples")
    c.decode.schedule, c.orl.rollout_rows, c.orl.rollout_segment_iterations = "per_row", 2, 4
    submits.clear()
    out = train(c, progress=False)
    runs[segments] = (load_file(os.path.join(out, "params.safetensors")),
                      read_jsonl(str(tmp_path / f"segments_{segments}" / "metrics.jsonl")))
    if segments:
      assert sum(submits) == 2 * 16 and len(submits) > 2 * 2, submits   # 2 iterations, 2 chunks
  assert len(submits) == 2 * 2          # one call a chunk without segments
  _same_run(runs[True], runs[False])
