"""Shardcast-style weight broadcast: the origin publishes sharded checkpoints, relays fan them out,
workers download them in parallel from several sources, verified shard by shard and as a whole.

See ``manifest`` (format, split/assemble), ``server`` (store, HTTP server, relay) and ``client``
(``download``).
"""

from node.weights.client import DownloadError, DownloadStats, SourceError, download, fetch_manifest
from node.weights.manifest import DEFAULT_SHARD_SIZE, IntegrityError, Manifest, ShardInfo, assemble, split
from node.weights.relay import Relay
from node.weights.serve import RateLimiter, serve_weights
from node.weights.store import WeightStore

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "DownloadError",
    "DownloadStats",
    "IntegrityError",
    "Manifest",
    "RateLimiter",
    "Relay",
    "ShardInfo",
    "SourceError",
    "WeightStore",
    "assemble",
    "download",
    "fetch_manifest",
    "serve_weights",
    "split",
]
