"""`packrat.ray_serve:app`, kept working for `serve run` and KubeRay configs: the Ray Serve front end."""
from packrat.frontends.ray_serve import app  # noqa: F401
