"""The run config: its typed sections (`sections`), the build from the command line's
config (`build`), and the checks across sections with the configs derived from it for each
owner (`derive`)."""
