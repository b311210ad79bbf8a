"""How a Learner trains on several devices or processes: DataParallel, DDP, FSDP, compiling, pre-flight checks."""
