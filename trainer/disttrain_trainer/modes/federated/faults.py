"""Test hooks for fault injection in the federated client (`ClientRunner(faults={client id: hook})`).

A drop hook makes the client really stop talking at that stage: it raises
`Dropped`, its loop returns, and it never calls the aggregator again, exactly as
a client whose device went away. The others change what the client sends.
"""

from __future__ import annotations

# Secure aggregation stages (Bonawitz et al. 2017): a dropout at each one.
DROP_AFTER_ADVERTISE = "drop_after_advertise"  # keys advertised, no shares sent
DROP_AFTER_SHARE = "drop_after_share"  # shares sent, no masked input
DROP_AFTER_MASKED_INPUT = "drop_after_masked_input"  # masked input sent, never asks for the unmask plan
DROP_BEFORE_REVEAL = "drop_before_reveal"  # has the unmask plan, reveals nothing
# A masking bug on purpose: masks against everyone who advertised keys (U1) instead of U2; the
# aggregator's check of the unmasked weight must refuse the round.
MASK_OVER_KEY_BOOK = "mask_over_key_book"
# What an update carries.
NAN = "nan"  # one NaN in the first tensor
# A Byzantine client: its update sign-flipped and scaled to SIGN_FLIP_NORM_FRACTION x maxUpdateNorm,
# so it passes the norm check and pulls a mean as far as the check allows.
SIGN_FLIP = "sign_flip"
SIGN_FLIP_NORM_FRACTION = 0.9
# A client whose update is scaled to OVERSIZED_NORM_FACTOR x maxUpdateNorm and, in a secure round,
# not clipped before masking: the aggregator must refuse the sum (or, in plain rounds, the update).
OVERSIZED = "oversized"
OVERSIZED_NORM_FACTOR = 50.0

DROPS = (DROP_AFTER_ADVERTISE, DROP_AFTER_SHARE, DROP_AFTER_MASKED_INPUT, DROP_BEFORE_REVEAL)
ALL = (*DROPS, MASK_OVER_KEY_BOOK, NAN, SIGN_FLIP, OVERSIZED)


class Dropped(Exception):
    """Raised at a drop hook's stage: the client stops for good."""
