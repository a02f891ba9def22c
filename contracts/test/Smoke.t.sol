// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;
import {Test} from "./utils/Test.sol";
import {IntellectToken} from "../src/IntellectToken.sol";
contract SmokeTest is Test {
    function test_mint() public {
        IntellectToken t = new IntellectToken(address(this));
        t.mint(address(1), 5);
        assertEq(t.balanceOf(address(1)), 5);
    }
}
