"""Front ends: adapters from a serving engine's requests to packrat's Engine (Ray Serve; TorchServe's control files)."""
