import unittest

from roman import from_roman, to_roman

KNOWN = {
    1: "I", 3: "III", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD",
    900: "CM", 1994: "MCMXCIV", 2024: "MMXXIV", 3888: "MMMDCCCLXXXVIII", 3999: "MMMCMXCIX",
}


class RomanTest(unittest.TestCase):
    def test_known_values(self):
        for n, s in KNOWN.items():
            self.assertEqual(to_roman(n), s)
            self.assertEqual(from_roman(s), n)

    def test_round_trip(self):
        for n in range(1, 4000):
            self.assertEqual(from_roman(to_roman(n)), n)

    def test_out_of_range(self):
        for bad in (0, -1, 4000, 10**6, 2.0, "5", True, None):
            with self.assertRaises(ValueError, msg=repr(bad)):
                to_roman(bad)

    def test_non_canonical(self):
        for bad in ("", "IIII", "IC", "MMMM", "iv", "VX", "IL", "XM", "CCCC", "ABC", "IIV", " I"):
            with self.assertRaises(ValueError, msg=repr(bad)):
                from_roman(bad)


if __name__ == "__main__":
    unittest.main()
