"""Our own frontend: the embedded default that `make conformance` runs the suites against."""

from harness.frontends.reference.core import ReferenceFrontendCore
from harness.frontends.reference.driver import ReferenceDriver
from harness.frontends.reference.frontend import ReferenceFrontend

__all__ = ["ReferenceDriver", "ReferenceFrontend", "ReferenceFrontendCore"]
