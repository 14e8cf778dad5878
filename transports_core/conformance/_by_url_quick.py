"""The quick profile of the suite at ``--transport-url`` (``transports conformance
--quick URL``): every property once, in about a minute on a local store. The scenarios
both twins share run on the sync twin only, the async-only ones on the async twin; real
lapses are shorter, and the model-based scenario tries fewer examples.

Its name does not start with ``test_``, so pytest collects it only when named, as the CLI
does. What it trades away is depth, not properties: each one is still checked.
"""

from __future__ import annotations

# The module, not its classes: a class imported here would be collected a second time.
from . import _by_url
from ._suite import TransportSuite

__all__ = ["TestQuickAsyncTransportAtUrl", "TestQuickTransportAtUrl"]


class _Quick:
    real_brief = 0.25
    real_margin = 0.1
    real_time_model_examples = 3
    real_time_model_steps = 12


class TestQuickTransportAtUrl(_Quick, _by_url.TestTransportAtUrl):
    pass


class TestQuickAsyncTransportAtUrl(_Quick, _by_url.TestAsyncTransportAtUrl):
    """The async-only scenarios; the shared ones ran on the sync twin."""


# pytest collects only callables: this hides the shared scenarios from the async class.
for _name in dir(TransportSuite):
    if _name.startswith("test_"):
        setattr(TestQuickAsyncTransportAtUrl, _name, None)
