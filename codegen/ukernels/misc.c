/* Micro-kernels for the misc family. See kiln_uk.h for the contract. */
#include "kiln_uk.h"
