"""`packrat.ray_serve:app`, the Ray Serve application builder: what `serve run`, KubeRay's
RayService (`packrat export k8s`) and Python (`from packrat.ray_serve import app`) name. Its one
spelling; the front end itself is packrat/frontends/ray_serve.py."""
from packrat.frontends.ray_serve import app  # noqa: F401
