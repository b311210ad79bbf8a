"""The callback protocol (`core`) and fastai's callbacks: checkpoints, schedules, trackers, loggers, clipping."""
