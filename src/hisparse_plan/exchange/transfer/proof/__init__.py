"""check_transfer: every row of a program decoded against both engines' places, in boxes;
imports the transfer's facts and program."""
