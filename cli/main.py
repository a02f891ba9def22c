"""`intellect-node`: the command-line front end. Thin: it parses, calls node/ and pool/, prints.

One module per command group (`keys_cmd`, `contracts_cmd`, `provider_cmd`, `pool_cmd`, `work_cmd`,
`chain_cmd`, `model_cmd`, `devnet_cmd`, `status_cmd`, and `daemons` for `join`, `validate` and
`coordinator`); this one is the root group and `entry`, which catches the project's one error root.

Every failure a user can cause prints one line, `error: <problem>; <fix>`, and exits 1
(usage errors exit 2).
"""

from __future__ import annotations

import sys

import click

from node.errors import IntellectError, one_line

from .chain_cmd import audit_cmd, chain_group
from .contracts_cmd import contracts_group, token_group
from .daemons import COMMANDS as DAEMON_COMMANDS
from .devnet_cmd import devnet_cmd
from .doctor_cmd import doctor_command
from .explorer_cmd import explorer_command
from .keys_cmd import keys_group
from .model_cmd import eval_cmd, rollout_group, toploc_group
from .pool_cmd import pool_group
from .provider_cmd import node_group, provider_group
from .status_cmd import status_command
from .work_cmd import validator_group, work_group


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="intellect-node")
def cli() -> None:
    """intellect-node: decentralized reinforcement learning with verified inference.

    Keys: --keystore FILE (password from INTELLECT_PASSWORD or a prompt), or a hex key in
    INTELLECT_PRIVATE_KEY for development. Chain: --rpc-url / INTELLECT_RPC_URL and
    --deployment / INTELLECT_DEPLOYMENT. Amounts are in tokens (`12.5`) or base units (`100wei`).
    """


for _command in (
    keys_group,
    contracts_group,
    token_group,
    provider_group,
    node_group,
    pool_group,
    work_group,
    validator_group,
    chain_group,
    audit_cmd,
    toploc_group,
    rollout_group,
    eval_cmd,
    devnet_cmd,
    status_command,
    doctor_command,
    explorer_command,
    *DAEMON_COMMANDS,
):
    cli.add_command(_command)


def entry(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status (tests call this in-process)."""
    try:
        cli.main(args=argv, prog_name="intellect-node", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except IntellectError as exc:
        click.echo(f"error: {one_line(exc)}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def main() -> None:
    from node.runtime import command_done

    code = entry()
    command_done()
    sys.exit(code)


if __name__ == "__main__":
    main()
