"""TorchServe handlers: the packrat handler and the stock baseline it is compared with."""
