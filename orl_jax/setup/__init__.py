"""What a run of a config is set up with, before any step: which weights, family, tokenizer,
model config and mesh (`resolve`, what the dry run and the compile command need, allocating
nothing), the task and starting parameters of a run (`build`: `Setup`, `build_setup`,
`initial_params`), and the table of settings its checkpoints record (`recorded`).

Training, evaluation, serving and the applications all start here; nothing here imports the
training package."""
