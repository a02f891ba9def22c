"""The devnet's chain side and cast: the task spec, the options, the roles' keys, the pool (created,
funded, started with the coordinator's bootstrap) and a joined node for `--chain-only`."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from libp2p.peer.id import ID

from node import ops
from node.chain import ChainClient
from node.chain.anvil import ANVIL_KEYS
from node.chain.messages import tokens
from node.chain.rpc import RpcClient
from node.keys import from_hex
from node.p2p.host import identity_from_eth_key

from ..deploy import TOKEN, DeployParams, deploy

ROOT = Path(__file__).resolve().parents[2]
# Completion budget of the devnet's tasks and evaluation: twice the largest thinking-budget target (32), so
# running on to the limit is the worst length for every target. Any early stop then scores at least as well
# as no stop, and GRPO can only push the end-of-sequence token up from where the tiny random model starts
# (it ends a few percent of its completions early). With 48, a very short completion on a 32-token target
# scored below running on, and unlucky first steps could push EOS down until it was never sampled again,
# leaving the reward flat (see bench/devnet_learns.py).
DEVNET_MAX_TOKENS = 64


def task_spec(model: str, env: str) -> dict[str, Any]:
    from node.tasks import content_hash, get_env

    environment = get_env(env)
    return {
        "name": "devnet-code" if env == "code" else "devnet-arithmetic",
        "model": model,
        "environment": env,
        # pinned: a node whose environment differs (another release, a changed plug-in) refuses the pool
        "environment_version": environment.version,
        "environment_hash": content_hash(environment),
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": DEVNET_MAX_TOKENS, "exact": True},
        "group_size": 8,
        "async_level": 2,
    }


@dataclass(frozen=True)
class DevnetOptions:
    workdir: Path
    port: int = 0
    chain_id: int = 31337
    keep_running: bool = False
    as_json: bool = False
    window: int = 24 * 3600
    chain_only: bool = False
    model: str = "tiny"
    env: str = "thinking-budget"
    train: bool | None = None  # None: on for the tiny model or with a GPU (SmolLM2 steps take minutes on a CPU)
    train_files: int = 2
    seed: int | None = None  # fixed task seeds for the coordinator
    eval_problems: int = 0  # after training: score the base and final policies on this many held-out problems
    steps: int = 3
    workers: int = 2
    adversary: bool = False
    adversary_kinds: tuple[str, ...] = ("model",)  # one cheating worker per kind, or "lying-validator" alone
    report: Path | None = None
    timeout: float = 900.0
    live: bool | None = None


@dataclass(frozen=True)
class Roles:
    """Keys of the devnet's parties: anvil's prefunded accounts (public, local only)."""

    owner: Any
    coordinator: Any
    validator: Any
    provider: Any
    node: Any
    workers: list[tuple[Any, Any]] = field(default_factory=list)
    jurors: list[Any] = field(default_factory=list)  # validators that only sit on dispute committees
    liar: Any = None  # the lying validator of `--adversary-kind lying-validator`

    @classmethod
    def default(cls) -> Roles:
        k = [from_hex(x) for x in ANVIL_KEYS]
        # Beyond anvil's ten funded accounts: fixed keys, given ether by `create_pool` (local only).
        extra = [from_hex("0x" + hashlib.sha256(f"intellect devnet {n}".encode()).hexdigest()) for n in range(3)]
        # (provider, node) pairs for up to 3 workers: accounts 3/4, 5/6, 7/8
        return cls(
            owner=k[0], coordinator=k[1], validator=k[2], provider=k[3], node=k[4],
            workers=[(k[3], k[4]), (k[5], k[6]), (k[7], k[8])], jurors=extra[:2], liar=extra[2],
        )  # fmt: skip

    @property
    def validators(self) -> list[Any]:
        """Every validator the devnet's pool names: the checking one, the jurors and the liar."""
        return [self.validator, *self.jurors, self.liar]


#: Devnet dispute terms: an hour to appeal and an hour to vote (the devnet fast-forwards the chain by
#: the validation window once work is checked and disputes are decided), committees of up to three.
DEVNET_DISPUTES = ops.DisputeTerms(appeal_period=3600, vote_period=3600, committee_size=3)


def peer_id_of(account: Any) -> str:
    return ID.from_pubkey(identity_from_eth_key(bytes(account.key)).public_key).to_base58()


async def create_pool(url: str, opts: DevnetOptions, roles: Roles, say: Any, bootstrap: str) -> dict[str, Any]:
    lying = opts.adversary and "lying-validator" in opts.adversary_kinds  # only then is the liar named
    async with RpcClient(url) as rpc:
        dep = await deploy(rpc, roles.owner, DeployParams(), rpc_url=url, progress=say)
        for v in roles.validators:  # gas for the keys beyond anvil's funded ones
            await rpc.request("anvil_setBalance", [v.address, hex(10**20)])
    dep.save(opts.workdir / "deployment.json")
    spec_bytes = json.dumps(task_spec(opts.model, opts.env), sort_keys=True).encode()
    (opts.workdir / "task-spec.json").write_bytes(spec_bytes)
    owner = await ChainClient.connect(url, dep, roles.owner)
    try:
        mint = [(roles.owner.address, 100_000)] + [(p.address, 1_000) for p, _ in roles.workers]
        mint += [(v.address, 1_000) for v in roles.validators]  # their dispute bonds
        for who, amount in mint:
            await owner.transact("IntellectToken", "mint", who, amount * TOKEN, what="mint")
        say("minted test tokens to the pool owner, the providers and the validators")
        spec = ops.PoolSpec(
            coordinator=roles.coordinator.address,
            spec_uri=(opts.workdir / "task-spec.json").resolve().as_uri(),
            spec_hash="0x" + hashlib.sha256(spec_bytes).hexdigest(),
            reward_rate=10**15,
            validation_window=opts.window,
            slash_amount=5 * TOKEN,
            min_stake=20 * TOKEN,
            bootstrap=bootstrap,
            validators=tuple(v.address for v in roles.validators if v is not roles.liar or lying),
            disputes=DEVNET_DISPUTES,
        )
        pool_id, _ = await ops.create_pool(owner, spec)
        await owner.transact("PoolManager", "startPool", pool_id, what="pool start")
        await ops.fund_pool(owner, pool_id, 10_000 * TOKEN)
        say(
            f"created, started and funded pool {pool_id} (reward {tokens(spec.reward_rate)}/unit, "
            f"window {opts.window} s, slash {tokens(spec.slash_amount)})"
        )
    finally:
        await owner.aclose()
    return {"deployment": dep, "pool": pool_id}


async def join_one_node(url: str, dep: Any, roles: Roles, pool_id: int, say: Any) -> None:
    """The chain-only devnet: one provider with one node joined by a coordinator's invite."""
    provider = await ChainClient.connect(url, dep, roles.provider)
    coord = await ChainClient.connect(url, dep, roles.coordinator)
    try:
        await ops.register_provider(provider, 100 * TOKEN)
        sig = await ops.node_signature(provider, roles.node, roles.provider.address)
        await ops.add_node(provider, roles.node.address, 1, sig)
        say(f"registered provider {roles.provider.address} and bound node {roles.node.address}")
        invite = await ops.make_invite(coord, roles.coordinator, pool_id, roles.node.address, 3600)
        await ops.join_pool(provider, invite)
        say(f"node {roles.node.address} joined pool {pool_id} with a coordinator's invite")
    finally:
        await provider.aclose()
        await coord.aclose()


# ---------------------------------------------------------------------------------------- processes


def resolve_train(opts: DevnetOptions) -> DevnetOptions:
    if opts.train is not None:
        return opts
    import torch

    return replace(opts, train=opts.model.startswith("tiny") or torch.cuda.is_available())


#: What a devnet run leaves in its folder: the roles' data folders and logs, and its own files.
RUN_DIRS = ("coordinator", "validator", "liar", "juror*", "worker*", "cheater*")
RUN_FILES = ("*.log", "deployment.json", "task-spec.json", "summary.json", "report.json", "report.reward.png",
             "eval.json")  # fmt: skip


def clear_previous_run(workdir: Path) -> list[str]:
    """Remove what an earlier devnet left in `workdir` (each run starts a new chain, so the roles' old
    databases, cursors and keys of an old deployment would only confuse them). Only in a folder that
    holds a devnet's `deployment.json`, and only the names a devnet writes: anything else stays.
    Returns the names removed."""
    if not (workdir / "deployment.json").is_file():
        return []
    gone = []
    for pattern in RUN_DIRS + RUN_FILES:
        for path in sorted(workdir.glob(pattern)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            gone.append(path.name)
    return gone
