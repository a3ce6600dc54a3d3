"""Ports lossbed keeps reliable by default, in one place."""

SSH = 22
# torch.distributed's rendezvous store (MASTER_PORT) as lossbed launches it.
RENDEZVOUS = 29500
# The torch-free RDMA tools' control connection and small store (harness.verbs.transfer,
# harness.verbs.collective).
CONTROL = 29499

ALWAYS_RELIABLE_TCP = (SSH, CONTROL, RENDEZVOUS)
