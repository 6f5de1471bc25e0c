import unittest

from billing import split_bill


class SplitBillTest(unittest.TestCase):
    def test_even(self):
        self.assertEqual(split_bill(900, 3), [300, 300, 300])

    def test_remainder_goes_to_the_first_people(self):
        self.assertEqual(split_bill(1000, 3), [334, 333, 333])

    def test_adds_up(self):
        for total in range(0, 50):
            for people in range(1, 7):
                self.assertEqual(sum(split_bill(total, people)), total)


if __name__ == "__main__":
    unittest.main()
