"""TorchServe handlers: the packrat handler and the stock baseline it is compared with.

Installed as packrat.handlers (pyproject's package-dir). An archive ships the handler's file, which
TorchServe loads by path; it imports the rest as packrat.handlers, from packrat's installation."""
