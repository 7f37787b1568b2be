"""What `train.py` runs: instantiate the configured datamodule, module, callbacks, logger and trainer, then fit."""
