"""What the engine runs on, none of it about programs or tapes: the worker threads, the weights'
committed versions, and the process-wide settings (the allocator, the cyclic collector). It
imports nothing of the rest of monadl."""
