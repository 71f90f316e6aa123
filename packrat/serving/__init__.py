"""Serving one model: the engine, its controller and estimator, inference on a batch, the instance pool."""
