"""py-libp2p 0.8.1 patch (see `node.p2p.patches`, which imports this module): gossip signatures.

The node checks each new message's libp2p signature itself (`NodePubsub.push_msg`), so that a message that
fails is charged to the peer that forwarded it (the library drops it silently, uncharged, and does the
check again for every copy). The library's own check, which follows, is then answered from the digests of
messages verified moments ago instead of verifying twice."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from libp2p.crypto.keys import PublicKey
from libp2p.peer.id import ID
from libp2p.pubsub import pubsub as _pubsub_module
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX

_SIG_OK_MAX = 4096
_original_signature_validator = _pubsub_module.signature_validator
_signature_ok: OrderedDict[bytes, None] = OrderedDict()


def _message_digest(msg: rpc_pb2.Message) -> bytes:
    return hashlib.sha256(msg.SerializeToString(deterministic=True)).digest()


# Authors' public keys by author id (the key inside a secp256k1 or Ed25519 peer id), parsed once: the
# library parses it and rebuilds the id from it for every message (a third of a check's cost).
_AUTHOR_KEYS_MAX = 4096
_PUBSUB_SIGNING_PREFIX = PUBSUB_SIGNING_PREFIX.encode()
_author_keys: OrderedDict[bytes, PublicKey] = OrderedDict()


def _author_key(from_id: bytes) -> PublicKey | None:
    """The public key inside author id `from_id`, checked to give that id back; None when the id does
    not hold its key (an RSA author: the library's check, with the key sent along, handles it)."""
    key = _author_keys.get(from_id)
    if key is not None:
        _author_keys.move_to_end(from_id)
        return key
    sender = ID(from_id)
    key = sender.extract_public_key()
    if key is None or ID.from_pubkey(key) != sender:
        return None
    _author_keys[from_id] = key
    while len(_author_keys) > _AUTHOR_KEYS_MAX:
        _author_keys.popitem(last=False)
    return key


def _check_gossip_signature(msg: rpc_pb2.Message) -> bool:
    """The library's `signature_validator` with the author's key from `_author_key`."""
    if not msg.signature:
        return False
    key = _author_key(msg.from_id)
    if key is None:
        return bool(_original_signature_validator(msg))
    signed = rpc_pb2.Message(data=msg.data, topicIDs=msg.topicIDs, from_id=msg.from_id, seqno=msg.seqno)
    return bool(key.verify(_PUBSUB_SIGNING_PREFIX + signed.SerializeToString(), msg.signature))


def verify_gossip_signature(msg: rpc_pb2.Message) -> bool:
    """Whether `msg` carries a valid libp2p signature of its author (remembered for the library's check)."""
    digest = _message_digest(msg)
    if digest in _signature_ok:
        return True
    try:
        ok = _check_gossip_signature(msg)
    except Exception:  # a malformed key or author id
        ok = False
    if ok:
        _signature_ok[digest] = None
        while len(_signature_ok) > _SIG_OK_MAX:
            _signature_ok.popitem(last=False)
    return ok


_pubsub_module.signature_validator = verify_gossip_signature  # type: ignore[attr-defined]
