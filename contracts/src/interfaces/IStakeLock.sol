// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice What the registry asks the work ledger before stake leaves: until when must it stay?
interface IStakeLock {
    /// @notice The time before which `provider` may not withdraw: the latest deadline (and appeal end)
    /// of its recorded work, 0 with none.
    function lockedUntil(address provider) external view returns (uint64);
}
