#include "autograd/variable.h"
