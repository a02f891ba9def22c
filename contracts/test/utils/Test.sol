// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice The forge cheatcodes these tests use (forge-std cannot be installed here; see TOOLCHAIN).
interface Vm {
    struct Log {
        bytes32[] topics;
        bytes data;
        address emitter;
    }

    function warp(uint256 newTimestamp) external;
    function roll(uint256 newHeight) external;
    function prank(address sender) external;
    function startPrank(address sender) external;
    function stopPrank() external;
    function deal(address who, uint256 newBalance) external;
    function addr(uint256 privateKey) external pure returns (address);
    function sign(uint256 privateKey, bytes32 digest) external pure returns (uint8 v, bytes32 r, bytes32 s);
    function expectRevert(bytes calldata revertData) external;
    function expectRevert(bytes4 revertData) external;
    function expectRevert() external;
    function expectEmit(bool checkTopic1, bool checkTopic2, bool checkTopic3, bool checkData) external;
    function expectEmit(bool checkTopic1, bool checkTopic2, bool checkTopic3, bool checkData, address emitter)
        external;
    function expectEmit() external;
    function expectEmit(address emitter) external;
    function assume(bool condition) external pure;
    function label(address account, string calldata newLabel) external;
    function recordLogs() external;
    function getRecordedLogs() external returns (Log[] memory logs);
    function chainId(uint256 newChainId) external;
    function snapshotState() external returns (uint256 snapshotId);
    function revertToState(uint256 snapshotId) external returns (bool success);
    function pauseGasMetering() external;
    function resumeGasMetering() external;
}

/// @notice Cheatcodes, assertions and `bound`, without the test-runner hooks: a base for invariant
/// handlers and other helper contracts that forge must not pick up as test contracts.
abstract contract TestBase {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    function fail(string memory message) internal pure {
        revert(message);
    }

    function assertTrue(bool c, string memory m) internal pure {
        if (!c) revert(string.concat("assertTrue failed: ", m));
    }

    function assertTrue(bool c) internal pure {
        assertTrue(c, "");
    }

    function assertFalse(bool c, string memory m) internal pure {
        if (c) revert(string.concat("assertFalse failed: ", m));
    }

    function assertFalse(bool c) internal pure {
        assertFalse(c, "");
    }

    function assertEq(uint256 a, uint256 b, string memory m) internal pure {
        if (a != b) revert(string.concat("assertEq(uint) failed: ", m, " ", _u(a), " != ", _u(b)));
    }

    function assertEq(uint256 a, uint256 b) internal pure {
        assertEq(a, b, "");
    }

    function assertEq(address a, address b, string memory m) internal pure {
        if (a != b) revert(string.concat("assertEq(address) failed: ", m));
    }

    function assertEq(address a, address b) internal pure {
        assertEq(a, b, "");
    }

    function assertEq(bytes32 a, bytes32 b, string memory m) internal pure {
        if (a != b) revert(string.concat("assertEq(bytes32) failed: ", m));
    }

    function assertEq(bytes32 a, bytes32 b) internal pure {
        assertEq(a, b, "");
    }

    function assertEq(bool a, bool b, string memory m) internal pure {
        if (a != b) revert(string.concat("assertEq(bool) failed: ", m));
    }

    function assertEq(bool a, bool b) internal pure {
        assertEq(a, b, "");
    }

    function assertEq(string memory a, string memory b, string memory m) internal pure {
        if (keccak256(bytes(a)) != keccak256(bytes(b))) revert(string.concat("assertEq(string) failed: ", m));
    }

    function assertEq(string memory a, string memory b) internal pure {
        assertEq(a, b, "");
    }

    function assertEq(bytes memory a, bytes memory b, string memory m) internal pure {
        if (keccak256(a) != keccak256(b)) revert(string.concat("assertEq(bytes) failed: ", m));
    }

    function assertEq(bytes memory a, bytes memory b) internal pure {
        assertEq(a, b, "");
    }

    function assertLe(uint256 a, uint256 b, string memory m) internal pure {
        if (a > b) revert(string.concat("assertLe failed: ", m, " ", _u(a), " > ", _u(b)));
    }

    function assertLe(uint256 a, uint256 b) internal pure {
        assertLe(a, b, "");
    }

    function assertLt(uint256 a, uint256 b, string memory m) internal pure {
        if (a >= b) revert(string.concat("assertLt failed: ", m, " ", _u(a), " >= ", _u(b)));
    }

    function assertLt(uint256 a, uint256 b) internal pure {
        assertLt(a, b, "");
    }

    function assertGe(uint256 a, uint256 b, string memory m) internal pure {
        if (a < b) revert(string.concat("assertGe failed: ", m, " ", _u(a), " < ", _u(b)));
    }

    function assertGe(uint256 a, uint256 b) internal pure {
        assertGe(a, b, "");
    }

    function assertGt(uint256 a, uint256 b, string memory m) internal pure {
        if (a <= b) revert(string.concat("assertGt failed: ", m, " ", _u(a), " <= ", _u(b)));
    }

    function assertGt(uint256 a, uint256 b) internal pure {
        assertGt(a, b, "");
    }

    /// @dev Maps x into [lo, hi] (inclusive) without discarding fuzz runs.
    function bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        require(lo <= hi, "bound: lo > hi");
        if (x >= lo && x <= hi) return x;
        uint256 size = hi - lo;
        if (size == type(uint256).max) return x;
        return lo + (x % (size + 1));
    }

    function _u(uint256 v) private pure returns (string memory) {
        if (v == 0) return "0";
        uint256 len;
        for (uint256 t = v; t != 0; t /= 10) len++;
        bytes memory b = new bytes(len);
        while (v != 0) {
            b[--len] = bytes1(uint8(48 + v % 10));
            v /= 10;
        }
        return string(b);
    }
}

/// @notice A minimal stand-in for forge-std's Test: cheatcodes, assertions, bounds and invariant targets.
abstract contract Test is TestBase {
    bool public IS_TEST = true;

    address[] private _targetContracts;

    struct FuzzSelector {
        address addr;
        bytes4[] selectors;
    }

    FuzzSelector[] private _targetSelectors;

    event log_named_uint(string key, uint256 val);
    event log_named_string(string key, string val);

    function targetContract(address target) internal {
        _targetContracts.push(target);
    }

    function targetSelector(FuzzSelector memory s) internal {
        _targetSelectors.push(s);
    }

    function targetContracts() public view returns (address[] memory) {
        return _targetContracts;
    }

    function targetSelectors() public view returns (FuzzSelector[] memory) {
        return _targetSelectors;
    }
}
