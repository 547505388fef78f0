"""Published BLAKE2s known-answer vectors that the MAC tests share (``test_golden_mac.py`` for
the golden model, ``test_mac.py`` for the core). A plain module, not a test module: test modules
import it, never each other."""

__all__ = ["KAT_KEY", "KAT", "kat_input"]

#: The BLAKE2 reference repository (github.com/BLAKE2/BLAKE2), ``testvectors/blake2s-test.txt``
#: (the keyed known-answer tests of ``blake2s-kat.txt``): key ``00 01 .. 1f``, input ``00 01 ..
#: (n-1)``, BLAKE2s-256. The lengths chosen cross the block boundaries.
KAT_KEY = bytes(range(32))
KAT = {
    0: "48a8997da407876b3d79c0d92325ad3b89cbb754d86ab71aee047ad345fd2c49",
    1: "40d15fee7c328830166ac3f918650f807e7e01e177258cdc0a39b11f598066f1",
    2: "6bb71300644cd3991b26ccd4d274acd1adeab8b1d7914546c1198bbe9fc9d803",
    32: "c03bc642b20959cbe133a0303e0c1abff3e31ec8e1a328ec8565c36decff5265",
    63: "c65382513f07460da39833cb666c5ed82e61b9e998f4b0c4287cee56c3cc9bcd",
    64: "8975b0577fd35566d750b362b0897a26c399136df07bababbde6203ff2954ed4",
    65: "21fe0ceb0052be7fb0f004187cacd7de67fa6eb0938d927677f2398c132317a8",
}


def kat_input(n: int) -> bytes:
    return bytes(i & 0xFF for i in range(n))
