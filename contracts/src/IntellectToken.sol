// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title IntellectToken
/// @notice The ERC-20 (with EIP-2612 permit) used for stake and rewards on test networks.
/// @dev Only the owner mints; on a production network the owner would be a governance contract.
contract IntellectToken is ERC20, ERC20Permit, Ownable {
    /// @param initialOwner Receives the minting right.
    constructor(address initialOwner) ERC20("Intellect", "INTL") ERC20Permit("Intellect") Ownable(initialOwner) {}

    /// @notice Mints `amount` base units to `to`. Emits the ERC-20 `Transfer` event from the zero address.
    /// @param to Recipient.
    /// @param amount Amount in base units (18 decimals).
    function mint(address to, uint256 amount) external onlyOwner {
        _mint(to, amount);
    }
}
