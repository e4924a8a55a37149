"""What a run reads from and leaves on disk beside its parameter folders
(`orl_jax.models.params_io`): where its starting weights come from (`weights`), its checkpoints
(`checkpoint`), the settings they were written under (`run_settings`) and a trained run's record
(`trained_run`)."""
