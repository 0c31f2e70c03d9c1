"""Asynchronous data parallel with a parameter server (Downpour SGD; Dean et al. 2012) over gRPC.

Its entry, `entry.main(cfg)`, plays the role DISTTRAIN_ROLE names: a server shard (`server`) holding
some of the parameters and their optimizer state, or a worker (`worker`) that
pulls, computes and pushes without waiting for any other worker.
"""
