"""How packets travel: the UDP datagram transport (and, in verbs/, real RDMA queue pairs)."""
