"""The callback protocol (`core`) and fastai's callbacks: schedules, `lr_find`, trackers, loggers, clipping, ..."""
