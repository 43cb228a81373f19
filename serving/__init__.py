"""Publishing versions to vLLM and what each replica serves: the publisher, the release bus, the replica's
loader, the canary and eval gate. Built on trainer's registry and artifacts; a replica's loader runs without
torch (tests/serving/test_torch_free.py keeps it so)."""
