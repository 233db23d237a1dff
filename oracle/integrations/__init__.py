"""Adapters that let other programs ask moe-oracle instead of their own selection code.

Each adapter imports its host program lazily, inside its own functions: importing
`oracle` (or this package) never pulls in torch or the host.
"""
