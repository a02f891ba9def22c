// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice What the registry asks the pool manager: is a node in a pool right now, and how much stake
/// must its provider keep for the pools its nodes are in?
interface IPoolMembership {
    /// @notice The pool a node is an active member of, or 0 when it is in none.
    function poolOf(address node) external view returns (uint256);

    /// @notice The stake `provider` must keep while any of its nodes is in a pool: the sum of the minimum
    /// stakes of the distinct pools its nodes are in (0 with none), so each pool's minimum is stake that
    /// pool can slash.
    function stakeFloor(address provider) external view returns (uint256);
}
