"""The impairment backends lossbed has, most capable first."""

from testbed.impair import bpf, netem, nft

BACKENDS = {"netem": netem, "bpf": bpf, "nft": nft}
PREFERENCE = ("netem", "bpf", "nft")
