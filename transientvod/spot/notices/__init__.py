"""Interruption notices as a worker hears them: from EC2's or GCE's metadata service, through
one source interface, watched on a thread beside the training loop."""
