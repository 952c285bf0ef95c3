"""The search: the space, the experiment file, the study and its storage, the executors and
workers that run trials, calibration, confirmation, warm start, baselines, fronts and `oneshot/`."""
