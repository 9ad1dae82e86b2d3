"""Running jobs: one job on a board and how it ended, the scheduler over every board, the run's stages, the progress view."""
