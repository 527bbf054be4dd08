"""corewire: a conformance harness for vLLM's engine-core wire protocol."""
