"""Deploying: model archives, running TorchServe, a local Ray cluster, Kubernetes manifests."""
