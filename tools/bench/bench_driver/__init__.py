"""The modules of tools/bench.sh driver (run that script, not this package):

- common: paths, constants, logging;
- data: keys, population, trees and stores;
- drivers: Salt's opts and the drivers' modules;
- measure: the measurements, one size after another;
- report: the table of medians and ratios.
"""
