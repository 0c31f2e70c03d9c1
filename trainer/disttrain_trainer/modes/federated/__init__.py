"""Federated learning over gRPC (McMahan et al. 2017; Bonawitz et al. 2017).

Its entry, `entry.main(cfg)`, plays the role DISTTRAIN_ROLE names: the aggregator (`aggregator`)
or a client process hosting several simulated clients (`client_process`).
"""
