"""Inference engines: the :class:`~services.engines.engine.Engine` protocol, the embedded
torch engine (:mod:`services.engines.torch`) and the SGLang client
(:mod:`services.engines.sglang`)."""
