"""Checks beyond the visible test: the contract stated in the instruction."""
import unittest

from billing import split_bill


class HiddenSplitBillTest(unittest.TestCase):
    def test_contract(self):
        for total in range(0, 200, 7):
            for people in range(1, 12):
                amounts = split_bill(total, people)
                self.assertEqual(len(amounts), people)
                self.assertEqual(sum(amounts), total)
                self.assertLessEqual(max(amounts) - min(amounts), 1)
                self.assertEqual(amounts, sorted(amounts, reverse=True))

    def test_rejects_nobody(self):
        with self.assertRaises(ValueError):
            split_bill(100, 0)


if __name__ == "__main__":
    unittest.main()
