"""Component suites: connector roles plugged into harness-owned fakes (no engines, no frontend).

The frontend option does not apply; the unit under test is chosen by $COREWIRE_KV_WORKER
(see harness.components).
"""
