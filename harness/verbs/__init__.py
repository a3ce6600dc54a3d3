"""Real RDMA verbs (rdma-core's pyverbs): queue pairs of the UD, UC and RC kinds."""
