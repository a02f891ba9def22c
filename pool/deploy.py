"""Deploying the protocol contracts and wiring their roles."""

from __future__ import annotations

from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address

from node.chain import abi
from node.chain.deployment import Deployment
from node.chain.rpc import RpcClient
from node.chain.tx import TxSender

DAY = 86_400
TOKEN = 10**18
#: Receives slashed stake on a local chain when no treasury is named: an address nobody administers
#: (the treasury is never the admin by default). Any real network must name one.
LOCAL_TREASURY = "0x000000000000000000000000000000000000dEaD"
SLASHER_ROLE = "0x" + keccak(text="SLASHER_ROLE").hex()


@dataclass(frozen=True)
class DeployParams:
    treasury: str | None = None
    unbonding_period: int = 7 * DAY
    stake_per_compute_unit: int = 10 * TOKEN
    min_provider_stake: int = 10 * TOKEN


async def deploy(
    rpc: RpcClient,
    deployer: LocalAccount,
    params: DeployParams,
    *,
    network: str = "local",
    rpc_url: str = "",
    progress: object = None,
) -> Deployment:
    """Deploy token, registry, pool manager and ledger; grant the ledger SLASHER_ROLE and wire the
    registry to the pool manager and the ledger's stake lock. Validators are named per pool, by its
    owner (`PoolSpec.validators`). The deployment's `extra["constructor_args"]` holds each contract's
    ABI-encoded constructor arguments, which a block explorer needs to verify it (node/chain/verify.py)."""
    chain_id = await rpc.chain_id()
    sender = TxSender(rpc, deployer, chain_id)
    say = progress if callable(progress) else (lambda _msg: None)

    constructor_args: dict[str, str] = {}  # for explorer verification (node/chain/verify.py)

    async def create(name: str, *args: object) -> tuple[str, int]:
        contract = abi.load(name)
        data = contract.deploy_data(args)
        receipt = await sender.send(None, data, what=f"deploy {name}")
        rc = await rpc.request("eth_getTransactionReceipt", [receipt.tx_hash])
        address = to_checksum_address(rc["contractAddress"])
        say(f"deployed {name} at {address} (gas {receipt.gas_used})")
        constructor_args[name] = contract.constructor_args(args)
        return address, receipt.block_number

    if params.treasury is None and network != "local":
        raise ValueError(f"a deployment on {network} needs a treasury address (the admin is not one by default)")
    treasury = params.treasury or LOCAL_TREASURY
    token, first_block = await create("IntellectToken", deployer.address)
    registry, _ = await create(
        "ProviderRegistry",
        token,
        deployer.address,
        treasury,
        params.unbonding_period,
        params.stake_per_compute_unit,
        params.min_provider_stake,
    )
    pools, _ = await create("PoolManager", registry)
    ledger, _ = await create("WorkLedger", token, registry, pools)

    reg = abi.load("ProviderRegistry")
    await sender.send(registry, reg.fn("setPoolManager").encode([pools]), what="wire registry to pool manager")
    await sender.send(
        registry, reg.fn("setStakeLock").encode([ledger]), what="wire registry to the ledger's stake lock"
    )
    await sender.send(
        registry, reg.fn("grantRole").encode([SLASHER_ROLE, ledger]), what="grant the ledger SLASHER_ROLE"
    )
    return Deployment(
        chain_id=chain_id,
        contracts={"IntellectToken": token, "ProviderRegistry": registry, "PoolManager": pools, "WorkLedger": ledger},
        block=first_block,
        network=network,
        deployer=deployer.address,
        rpc_url=rpc_url,
        extra={"constructor_args": constructor_args},
    )
