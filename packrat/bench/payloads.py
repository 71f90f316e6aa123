"""The request body a load test sends for one model sample, in each encoding the handler accepts:
packrat.codec.payloads, where the profiler's served points find them too (this stage is above
profiling's)."""
from __future__ import annotations

from packrat.codec.payloads import (  # noqa: F401  (re-exported)
    CONTENT_TYPES,
    JPEG_HEIGHT,
    JPEG_QUALITY,
    JPEG_SEED,
    JPEG_WIDTH,
    PAYLOAD_KINDS,
    TEXT,
    build_payload,
    check_payload,
    check_payload_of,
    natural_payload,
    payload_of,
    served_payload,
    synthetic_jpeg,
)
