"""Ceilings measured beside torchbay in the same run: a bare ASGI echo, a naive FastAPI server
running the model in its thread pool, and the model in process (no HTTP at all)."""
