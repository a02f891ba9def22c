// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice What the registry asks the pool manager: is a node in a pool right now?
interface IPoolMembership {
    /// @notice The pool a node is an active member of, or 0 when it is in none.
    function poolOf(address node) external view returns (uint256);
}
