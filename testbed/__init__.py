"""lossbed's network side: hosts, clusters, impairment profiles, kernel backends, verification."""
