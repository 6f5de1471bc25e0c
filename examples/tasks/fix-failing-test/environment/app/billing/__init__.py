from billing.split import split_bill

__all__ = ["split_bill"]
