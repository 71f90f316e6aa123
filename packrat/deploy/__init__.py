"""Deploying: model archives, running TorchServe, Kubernetes manifests."""
