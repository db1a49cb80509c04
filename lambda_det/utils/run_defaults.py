"""The defaults of the run settings that both config systems have: the yaml configs' keys take
them in :func:`lambda_det.config.add_lambda_det_config`, the LazyConfig recipes
(configs/LazyConfigs/common/), the engine and the tools read them here."""

__all__ = ["AMP_DTYPE", "CHECK_IMAGES", "LOG_PERIOD"]

# SOLVER.AMP.DTYPE / train.amp.dtype: the autocast dtype of mixed precision.
AMP_DTYPE = "float16"
# DATALOADER.CHECK_IMAGES / dataloader.check_images: what the pre-flight reads of each image.
CHECK_IMAGES = "header"
# SOLVER.LOG_PERIOD / train.log_period: iterations between the metric writers' records.
LOG_PERIOD = 20
