// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20Errors} from "@openzeppelin/contracts/interfaces/draft-IERC6093.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";
import {Test} from "./utils/Test.sol";
import {IntellectToken} from "../src/IntellectToken.sol";

contract IntellectTokenTest is Test {
    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);
    event OwnershipTransferred(address indexed previousOwner, address indexed newOwner);

    bytes32 internal constant PERMIT_TYPEHASH =
        keccak256("Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)");

    IntellectToken internal token;
    address internal constant OWNER = address(0x0123);
    address internal constant ALICE = address(0xA1);
    address internal constant BOB = address(0xB0);
    uint256 internal constant HOLDER_PK = 0x4011;

    function setUp() public {
        token = new IntellectToken(OWNER);
    }

    function _permitDigest(address owner, address spender, uint256 value, uint256 nonce, uint256 deadline)
        internal
        view
        returns (bytes32)
    {
        bytes32 structHash = keccak256(abi.encode(PERMIT_TYPEHASH, owner, spender, value, nonce, deadline));
        return keccak256(abi.encodePacked("\x19\x01", token.DOMAIN_SEPARATOR(), structHash));
    }

    function test_constructor_setsMetadataAndOwner() public view {
        assertEq(token.name(), "Intellect");
        assertEq(token.symbol(), "INTL");
        assertEq(uint256(token.decimals()), 18);
        assertEq(token.owner(), OWNER);
        assertEq(token.totalSupply(), 0);
    }

    function test_constructor_revertsOnZeroOwner() public {
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableInvalidOwner.selector, address(0)));
        new IntellectToken(address(0));
    }

    function test_mint_byOwner() public {
        vm.expectEmit(true, true, false, true, address(token));
        emit Transfer(address(0), ALICE, 5e18);
        vm.prank(OWNER);
        token.mint(ALICE, 5e18);
        assertEq(token.balanceOf(ALICE), 5e18);
        assertEq(token.totalSupply(), 5e18);
    }

    function test_mint_revertsForNonOwner() public {
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, ALICE));
        vm.prank(ALICE);
        token.mint(ALICE, 1);
    }

    function test_mint_revertsToZeroAddress() public {
        vm.expectRevert(abi.encodeWithSelector(IERC20Errors.ERC20InvalidReceiver.selector, address(0)));
        vm.prank(OWNER);
        token.mint(address(0), 1);
    }

    function test_transfer_and_transferFrom() public {
        vm.prank(OWNER);
        token.mint(ALICE, 10);
        vm.prank(ALICE);
        assertTrue(token.transfer(BOB, 3));
        assertEq(token.balanceOf(ALICE), 7);
        assertEq(token.balanceOf(BOB), 3);

        vm.expectEmit(true, true, false, true, address(token));
        emit Approval(ALICE, BOB, 4);
        vm.prank(ALICE);
        token.approve(BOB, 4);
        assertEq(token.allowance(ALICE, BOB), 4);

        vm.prank(BOB);
        assertTrue(token.transferFrom(ALICE, BOB, 4));
        assertEq(token.balanceOf(BOB), 7);
        assertEq(token.allowance(ALICE, BOB), 0);

        vm.expectRevert(abi.encodeWithSelector(IERC20Errors.ERC20InsufficientAllowance.selector, BOB, 0, 1));
        vm.prank(BOB);
        token.transferFrom(ALICE, BOB, 1);

        vm.expectRevert(abi.encodeWithSelector(IERC20Errors.ERC20InsufficientBalance.selector, ALICE, 3, 4));
        vm.prank(ALICE);
        token.transfer(BOB, 4);
    }

    function test_permit_setsAllowanceAndConsumesNonce() public {
        address holder = vm.addr(HOLDER_PK);
        uint256 deadline = block.timestamp + 1 hours;
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(HOLDER_PK, _permitDigest(holder, BOB, 77, 0, deadline));
        assertEq(token.nonces(holder), 0);
        vm.expectEmit(true, true, false, true, address(token));
        emit Approval(holder, BOB, 77);
        token.permit(holder, BOB, 77, deadline, v, r, s);
        assertEq(token.allowance(holder, BOB), 77);
        assertEq(token.nonces(holder), 1);

        // Replaying the same signature now recovers some other address (the nonce moved on).
        bytes32 replayDigest = _permitDigest(holder, BOB, 77, 1, deadline);
        address recovered = ecrecover(replayDigest, v, r, s);
        vm.expectRevert(abi.encodeWithSelector(ERC20Permit.ERC2612InvalidSigner.selector, recovered, holder));
        token.permit(holder, BOB, 77, deadline, v, r, s);
    }

    function test_permit_revertsWhenExpired() public {
        address holder = vm.addr(HOLDER_PK);
        vm.warp(1000);
        uint256 deadline = 999;
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(HOLDER_PK, _permitDigest(holder, BOB, 1, 0, deadline));
        vm.expectRevert(abi.encodeWithSelector(ERC20Permit.ERC2612ExpiredSignature.selector, deadline));
        token.permit(holder, BOB, 1, deadline, v, r, s);
    }

    function test_permit_revertsForWrongSigner() public {
        address holder = vm.addr(HOLDER_PK);
        uint256 deadline = block.timestamp + 1;
        bytes32 digest = _permitDigest(holder, BOB, 1, 0, deadline);
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(0xBEEF, digest);
        vm.expectRevert(
            abi.encodeWithSelector(ERC20Permit.ERC2612InvalidSigner.selector, vm.addr(0xBEEF), holder)
        );
        token.permit(holder, BOB, 1, deadline, v, r, s);
    }

    function test_domainSeparator_matchesEip712() public view {
        bytes32 expected = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("Intellect"),
                keccak256("1"),
                block.chainid,
                address(token)
            )
        );
        assertEq(token.DOMAIN_SEPARATOR(), expected);
    }

    function test_approve_revertsForZeroSpender() public {
        vm.expectRevert(abi.encodeWithSelector(IERC20Errors.ERC20InvalidSpender.selector, address(0)));
        vm.prank(ALICE);
        token.approve(address(0), 1);
    }

    function test_eip712Domain() public view {
        (, string memory name, string memory version, uint256 chainId, address verifying,,) = token.eip712Domain();
        assertEq(name, "Intellect");
        assertEq(version, "1");
        assertEq(chainId, block.chainid);
        assertEq(verifying, address(token));
    }

    function test_ownership_transferAndRenounce() public {
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, ALICE));
        vm.prank(ALICE);
        token.transferOwnership(ALICE);

        vm.expectEmit(true, true, false, false, address(token));
        emit OwnershipTransferred(OWNER, ALICE);
        vm.prank(OWNER);
        token.transferOwnership(ALICE);
        assertEq(token.owner(), ALICE);

        vm.prank(ALICE);
        token.mint(BOB, 1);
        assertEq(token.balanceOf(BOB), 1);

        vm.prank(ALICE);
        token.renounceOwnership();
        assertEq(token.owner(), address(0));
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, ALICE));
        vm.prank(ALICE);
        token.mint(BOB, 1);
    }
}
